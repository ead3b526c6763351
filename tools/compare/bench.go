package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/tools/compare/fio"
	"github.com/vdiskfs/vdiskfs/tools/compare/loadgen"
)

// runResult is one fio run of one workload on one target.
type runResult struct {
	Workload string    `json:"workload"`
	Target   string    `json:"target"`
	Round    int       `json:"round"` // 1-based
	Position int       `json:"position"`
	Start    time.Time `json:"start"`
	WallSec  float64   `json:"wall_s"` // the fio process, ramp included
	Load1    float64   `json:"load1"`  // the machine's 1-minute load average at the start

	// fio's figures (after the ramp).
	MBps       float64 `json:"mb_per_s"` // 10^6 bytes per second
	IOPS       float64 `json:"iops"`
	P50us      jfloat  `json:"p50_us"` // null when fio gave no percentiles
	P99us      jfloat  `json:"p99_us"`
	FioBytes   uint64  `json:"fio_bytes"`
	FioIOs     uint64  `json:"fio_ios"`
	FioCPUSec  float64 `json:"fio_cpu_s"`
	FioRuntime float64 `json:"fio_runtime_s"`

	// Counter deltas over the whole fio process (ramp included); nil = n/a.
	Req     *ioCount `json:"fuse_requests,omitempty"`
	Backend *ioCount `json:"backend,omitempty"`
	Meta    *ioCount `json:"metadata,omitempty"`
	Device  *ioCount `json:"device,omitempty"`
	Commits *uint64  `json:"commits,omitempty"` // vdiskfs journal commits during the run
	Flushes *uint64  `json:"flushes,omitempty"` // cache flushes the server sent to its backing
	// The server's backend latency over the run (vdiskfs in process): mean
	// and the histogram bucket bound at or below which 99% fell.
	BackendReadLat  *latency `json:"backend_read_latency,omitempty"`
	BackendWriteLat *latency `json:"backend_write_latency,omitempty"`
	ServerCPU       *float64 `json:"server_cpu_s,omitempty"`
}

// metrics are the derived per-run figures that get medians; NaN = n/a.
type metricDef struct {
	Key    string // JSON key
	Head   string // table heading
	Unit   string
	Digits int
	Lower  bool // lower is better
	get    func(r *runResult) float64
}

func perIO(c *ioCount) float64 {
	if c == nil || c.ios() == 0 {
		return math.NaN()
	}
	return float64(c.bytes()) / float64(c.ios()) / 1024
}

func rate(c *ioCount, sec float64) float64 {
	if c == nil || sec <= 0 {
		return math.NaN()
	}
	return float64(c.ios()) / sec
}

// serverBytes is the denominator of the server's CPU per GB: the bytes it
// served over the same window as its CPU time (the whole fio process, ramp
// included). Exact from the request counters; for a target without them
// (qemu-storage-daemon), fio's bytes scaled from its measured runtime to
// the whole window (the device's bytes would include other processes').
func serverBytes(r *runResult) float64 { return serverShare(r, ioCount.bytes, r.FioBytes) }

// serverShare is a count (exact: bytes or requests) of what the server
// served over its CPU's window, or fio's figure fromFio scaled to it.
func serverShare(r *runResult, exact func(ioCount) uint64, fromFio uint64) float64 {
	if r.Req != nil {
		return float64(exact(*r.Req))
	}
	if r.FioRuntime > 0 && r.WallSec > 0 {
		return float64(fromFio) * max(1, r.WallSec/r.FioRuntime)
	}
	return 0
}

// serverIOs is the denominator of the server's CPU per I/O, as
// serverBytes is of its CPU per GB: the requests it served over the
// whole window.
func serverIOs(r *runResult) float64 { return serverShare(r, ioCount.ios, r.FioIOs) }

var metrics = []metricDef{
	{Key: "mb_per_s", Head: "MB/s", Unit: "MB/s", Digits: 0, get: func(r *runResult) float64 { return r.MBps }},
	{Key: "iops", Head: "IOPS", Unit: "IOPS", Digits: 0, get: func(r *runResult) float64 { return r.IOPS }},
	{Key: "p50_us", Head: "p50 µs", Unit: "µs", Digits: 0, Lower: true, get: func(r *runResult) float64 { return float64(r.P50us) }},
	{Key: "p99_us", Head: "p99 µs", Unit: "µs", Digits: 0, Lower: true, get: func(r *runResult) float64 { return float64(r.P99us) }},
	{Key: "fuse_request_kib", Head: "FUSE req KiB", Unit: "KiB", Digits: 0, get: func(r *runResult) float64 { return perIO(r.Req) }},
	{Key: "backend_io_per_s", Head: "backend I/O/s", Unit: "I/O/s", Digits: 0, get: func(r *runResult) float64 { return rate(r.Backend, r.WallSec) }},
	{Key: "backend_io_kib", Head: "backend KiB", Unit: "KiB", Digits: 0, get: func(r *runResult) float64 { return perIO(r.Backend) }},
	{Key: "device_io_per_s", Head: "device I/O/s", Unit: "I/O/s", Digits: 0, get: func(r *runResult) float64 { return rate(r.Device, r.WallSec) }},
	{Key: "device_io_kib", Head: "device KiB", Unit: "KiB", Digits: 0, get: func(r *runResult) float64 { return perIO(r.Device) }},
	{Key: "server_cpu_s_per_gb", Head: "server CPU s/GB", Unit: "s/GB", Digits: 2, Lower: true, get: func(r *runResult) float64 {
		b := serverBytes(r)
		if r.ServerCPU == nil || b == 0 {
			return math.NaN()
		}
		return *r.ServerCPU / (b / 1e9)
	}},
	{Key: "server_cpu_us_per_io", Head: "server CPU µs/IO", Unit: "µs/IO", Digits: 1, Lower: true, get: func(r *runResult) float64 {
		n := serverIOs(r)
		if r.ServerCPU == nil || n == 0 {
			return math.NaN()
		}
		return *r.ServerCPU / n * 1e6
	}},
	{Key: "fio_cpu_s_per_gb", Head: "fio CPU s/GB", Unit: "s/GB", Digits: 2, Lower: true, get: func(r *runResult) float64 {
		if r.FioBytes == 0 {
			return math.NaN()
		}
		return r.FioCPUSec / (float64(r.FioBytes) / 1e9)
	}},
}

// benchConfig is what one comparison runs.
type benchConfig struct {
	Rounds   int
	Runtime  time.Duration
	Ramp     time.Duration
	Settle   time.Duration // pause after each run (after its fsync)
	Size     int64
	Jobs     []fio.Job
	Baseline string // the target ratios are taken against
}

// bench runs the rounds.
type bench struct {
	cfg     benchConfig
	targets []target
	runner  *fio.Runner
	device  *blockDevice // nil = no device columns
	log     io.Writer    // progress lines
	filled  map[string]bool
	last    map[string]string // target → the workload that ran on it last
}

// fillJob writes a whole file once (1 MiB, 16 in flight), so that the
// workloads that are not about thin space run on fully written targets:
// overwrites in place, reads of real data.
var fillJob = fio.Job{Name: "fill", Text: "[fill]\nioengine=libaio\ndirect=1\nrw=write\nbs=1M\niodepth=16\n"}

// orderFor is the order of the targets for the i-th workload of a round
// (called with round+workload index): the given order rotated left by
// round-1 places, so over any n consecutive calls each of n targets runs
// once in every position (with two: as given when odd, reversed when
// even), and the workloads of one round rotate too. Drift of the machine
// (other load, cache and device state) and the cost of running first or
// last then hit every target alike.
func orderFor(targets []target, round int) []target {
	n := len(targets)
	if n == 0 {
		return nil
	}
	k := ((round-1)%n + n) % n
	return append(slices.Clone(targets[k:]), targets[:k]...)
}

func (b *bench) logf(format string, args ...any) {
	if b.log != nil {
		fmt.Fprintf(b.log, format+"\n", args...)
	}
}

// prepare brings t into the state job needs: empty and thin for a fresh
// job, what the job before left for one that runs after it, fully written
// otherwise.
func (b *bench) prepare(ctx context.Context, t target, job fio.Job) error {
	if job.After != "" {
		if b.last[t.Name()] != job.After {
			return fmt.Errorf("%s: %s runs on what %s leaves, which did not run just before it (select both with --workloads)", t.Name(), job.Name, job.After)
		}
		return nil
	}
	if job.Fresh {
		b.filled[t.Name()] = false
		if err := t.Reset(ctx); err != nil {
			return fmt.Errorf("%s: reset before %s: %w", t.Name(), job.Name, err)
		}
		return nil
	}
	if b.filled[t.Name()] {
		return nil
	}
	start := time.Now()
	s, _, err := b.measure(ctx, t, fillJob)
	if err != nil {
		return fmt.Errorf("%s: fill: %w", t.Name(), err)
	}
	if err := syncTarget(t); err != nil {
		return fmt.Errorf("%s: fsync after fill: %w", t.Name(), err)
	}
	b.logf("  fill %-12s %6.0f MB/s (%.1fs)", t.Name(), s.BWBytes/1e6, time.Since(start).Seconds())
	b.filled[t.Name()] = true
	return nil
}

// run does every round and returns the runs in the order they ran.
func (b *bench) run(ctx context.Context) ([]runResult, error) {
	b.filled, b.last = map[string]bool{}, map[string]string{}
	var runs []runResult
	total := b.cfg.Rounds * len(b.cfg.Jobs) * len(b.targets)
	n := 0
	for round := 1; round <= b.cfg.Rounds; round++ {
		for ji, job := range b.cfg.Jobs {
			for pos, t := range orderFor(b.targets, round+ji) {
				if err := ctx.Err(); err != nil {
					return runs, err
				}
				n++
				if err := b.prepare(ctx, t, job); err != nil {
					return runs, err
				}
				r, err := b.runOne(ctx, t, job)
				if err != nil {
					return runs, err
				}
				r.Round, r.Position = round, pos+1
				if job.Fresh {
					b.filled[t.Name()] = false // written once, maybe not to the end
				}
				b.last[t.Name()] = job.Name
				runs = append(runs, r)
				b.logf("[%d/%d] round %d %-20s %-12s %8.0f MB/s %9.0f IOPS  p99 %7.0f µs",
					n, total, round, job.Name, t.Name(), r.MBps, r.IOPS, float64(r.P99us))
			}
		}
	}
	return runs, nil
}

// latency sums up a histogram delta.
type latency struct {
	N      uint64 `json:"n"`
	MeanUs jfloat `json:"mean_us"`
	P99Us  jfloat `json:"p99_us"` // upper bound of the bucket holding the 99th percentile
}

// latencyDelta is the latency of the observations between a and b; nil
// when unknown or empty.
func latencyDelta(a, b *image.HistogramSnapshot) *latency {
	if a == nil || b == nil || b.Count <= a.Count || len(a.Counts) != len(b.Counts) {
		return nil
	}
	d := image.HistogramSnapshot{Bounds: b.Bounds, Counts: make([]uint64, len(b.Counts)), Count: b.Count - a.Count, Sum: b.Sum - a.Sum}
	for i := range d.Counts {
		d.Counts[i] = b.Counts[i] - a.Counts[i]
	}
	return &latency{N: d.Count, MeanUs: jfloat(d.Mean() * 1e6), P99Us: jfloat(d.Quantile(0.99) * 1e6)}
}

// delta is b-a, nil when either is unknown.
func delta(a, b *uint64) *uint64 {
	if a == nil || b == nil {
		return nil
	}
	d := *b - *a
	return &d
}

// measure runs job on t: fio on its file, or the load generator for a
// target fio cannot reach (its figures in the same terms).
func (b *bench) measure(ctx context.Context, t target, job fio.Job) (fio.Summary, time.Duration, error) {
	gt, ok := t.(genTarget)
	if !ok {
		out, _, wall, err := b.runner.Run(ctx, job, fioPlace(t))
		if err != nil {
			return fio.Summary{}, wall, err
		}
		return out.Summary(), wall, nil
	}
	shape, err := loadgen.ParseShape(fio.Expand(job.Text, b.runner.Var))
	if err != nil {
		return fio.Summary{}, 0, fmt.Errorf("workload %s: %w", job.Name, err)
	}
	res, err := loadgen.Run(ctx, gt.engine(), shape, b.cfg.Size)
	if err != nil {
		return fio.Summary{}, res.Wall, fmt.Errorf("workload %s: %w", job.Name, err)
	}
	dir := "read"
	if shape.Write {
		dir = "write"
	}
	return fio.Summary{
		Bytes: res.Bytes, IOs: res.IOs, BWBytes: res.BW(), IOPS: res.IOPS(),
		P50Ns: float64(res.P50), P99Ns: float64(res.P99), MeanLatNs: float64(res.Mean),
		Dominant: dir, CPUSeconds: res.CPU.Seconds(), RuntimeMs: res.Elapsed.Milliseconds(),
	}, res.Wall, nil
}

// snapshot is a target's counters, the device's and the machine's load
// at one moment: taken before and after a run.
type snapshot struct {
	at    time.Time
	s     sample
	dev   ioCount
	devOK bool
	load1 float64
}

func (b *bench) snapshot(t target) snapshot {
	var sn snapshot
	if b.device != nil {
		var err error
		sn.dev, err = b.device.sample()
		sn.devOK = err == nil
	}
	sn.s = t.Sample()
	if l := loadAvg(); len(l) > 0 {
		sn.load1 = l[0]
	}
	sn.at = time.Now()
	return sn
}

// result is the run of job on t that fio summed up as sum, with wall
// its wall time and the counter deltas from s0 to s1.
func result(job fio.Job, t target, s0, s1 snapshot, sum fio.Summary, wall time.Duration) runResult {
	r := runResult{Workload: job.Name, Target: t.Name(), Start: s0.at, Load1: s0.load1}
	if s0.devOK && s1.devOK {
		d := s1.dev.sub(s0.dev)
		r.Device = &d
	}
	r.WallSec = wall.Seconds()
	r.MBps = sum.BWBytes / 1e6
	r.IOPS = sum.IOPS
	r.P50us = jfloat(sum.P50Ns / 1e3)
	r.P99us = jfloat(sum.P99Ns / 1e3)
	r.FioBytes, r.FioIOs = sum.Bytes, sum.IOs
	r.FioCPUSec = sum.CPUSeconds
	r.FioRuntime = float64(sum.RuntimeMs) / 1000
	a, z := s0.s, s1.s
	if a.Req != nil && z.Req != nil {
		d := z.Req.sub(*a.Req)
		r.Req = &d
	}
	if a.Backend != nil && z.Backend != nil {
		d := z.Backend.sub(*a.Backend)
		r.Backend = &d
	}
	if a.Meta != nil && z.Meta != nil {
		d := z.Meta.sub(*a.Meta)
		r.Meta = &d
	}
	r.BackendReadLat = latencyDelta(a.ReadLat, z.ReadLat)
	r.BackendWriteLat = latencyDelta(a.WriteLat, z.WriteLat)
	r.Commits = delta(a.Commits, z.Commits)
	r.Flushes = delta(a.Flushes, z.Flushes)
	if a.HasCPU && z.HasCPU {
		c := (z.CPU - a.CPU).Seconds()
		r.ServerCPU = &c
	}
	return r
}

// runOne runs job on t and takes the counter deltas around it.
func (b *bench) runOne(ctx context.Context, t target, job fio.Job) (runResult, error) {
	s0 := b.snapshot(t)
	sum, wall, err := b.measure(ctx, t, job)
	if err != nil {
		return runResult{Workload: job.Name, Target: t.Name()}, fmt.Errorf("%s: %w", t.Name(), err)
	}
	r := result(job, t, s0, b.snapshot(t), sum, wall)
	// Outside the measured window: make the run's writes durable (a
	// vdiskfs commit, ext4's metadata), then let the machine settle, so
	// that this run's leftovers do not land in the next target's run.
	if err := syncTarget(t); err != nil {
		return r, fmt.Errorf("%s: fsync after %s: %w", t.Name(), job.Name, err)
	}
	if b.cfg.Settle > 0 {
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-time.After(b.cfg.Settle):
		}
	}
	return r, nil
}
