package image

import (
	"math"
	"sync/atomic"
	"time"
)

// Counters count what every layer of the store passes down, so that the
// size of I/O can be seen at each step (the seed's diagnosis: "1 MB /
// 220,000 IOPS ≈ 4 KB per I/O" stayed invisible because no layer counted).
// All fields are safe for concurrent use; read them through Store.Metrics or
// Store.Counters.
type Counters struct {
	// Requests: calls of the Disk API (for a mount, one per FUSE read or
	// write).
	ReadRequests, ReadRequestBytes    atomic.Uint64
	WriteRequests, WriteRequestBytes  atomic.Uint64
	ReadRequestSize, WriteRequestSize Histogram // bytes

	// Map: lookups of a request's block range and the segments (data or
	// hole pieces) they returned; allocations of new blocks.
	Lookups, LookupSegments atomic.Uint64
	Allocations             atomic.Uint64 // allocator calls for data
	AllocatedBlocks         atomic.Uint64

	// Coalescer: data pieces in, backend runs out (runs ≤ pieces: one run
	// per physically contiguous stretch).
	CoalescePieces, CoalesceRuns atomic.Uint64

	// Backend data I/O.
	DataReads, DataReadBytes          atomic.Uint64
	DataWrites, DataWriteBytes        atomic.Uint64
	DataReadSize, DataWriteSize       Histogram // bytes
	DataReadLatency, DataWriteLatency Histogram // seconds
	// Backend metadata I/O: superblocks, journal, checkpoints.
	MetaReads, MetaReadBytes   atomic.Uint64
	MetaWrites, MetaWriteBytes atomic.Uint64
	Flushes                    atomic.Uint64
	FlushLatency               Histogram // seconds
	Discards                   atomic.Uint64
	Errors                     atomic.Uint64 // backend errors of any kind

	// Journal.
	Commits       atomic.Uint64 // journal commits written
	JournalBytes  atomic.Uint64
	CommitLatency Histogram // seconds, whole commit: flush, write, flush
	Checkpoints   atomic.Uint64
}

// CounterSnapshot is a point-in-time copy of the plain counters.
type CounterSnapshot struct {
	ReadRequests      uint64 `json:"read_requests"`
	ReadRequestBytes  uint64 `json:"read_request_bytes"`
	WriteRequests     uint64 `json:"write_requests"`
	WriteRequestBytes uint64 `json:"write_request_bytes"`
	Lookups           uint64 `json:"lookups"`
	LookupSegments    uint64 `json:"lookup_segments"`
	Allocations       uint64 `json:"allocations"`
	AllocatedBlocks   uint64 `json:"allocated_blocks"`
	CoalescePieces    uint64 `json:"coalesce_pieces"`
	CoalesceRuns      uint64 `json:"coalesce_runs"`
	DataReads         uint64 `json:"data_reads"`
	DataReadBytes     uint64 `json:"data_read_bytes"`
	DataWrites        uint64 `json:"data_writes"`
	DataWriteBytes    uint64 `json:"data_write_bytes"`
	MetaReads         uint64 `json:"meta_reads"`
	MetaReadBytes     uint64 `json:"meta_read_bytes"`
	MetaWrites        uint64 `json:"meta_writes"`
	MetaWriteBytes    uint64 `json:"meta_write_bytes"`
	Flushes           uint64 `json:"flushes"`
	Discards          uint64 `json:"discards"`
	Errors            uint64 `json:"errors"`
	Commits           uint64 `json:"commits"`
	JournalBytes      uint64 `json:"journal_bytes"`
	Checkpoints       uint64 `json:"checkpoints"`
}

func (c *Counters) snapshot() CounterSnapshot {
	return CounterSnapshot{
		ReadRequests: c.ReadRequests.Load(), ReadRequestBytes: c.ReadRequestBytes.Load(),
		WriteRequests: c.WriteRequests.Load(), WriteRequestBytes: c.WriteRequestBytes.Load(),
		Lookups: c.Lookups.Load(), LookupSegments: c.LookupSegments.Load(),
		Allocations: c.Allocations.Load(), AllocatedBlocks: c.AllocatedBlocks.Load(),
		CoalescePieces: c.CoalescePieces.Load(), CoalesceRuns: c.CoalesceRuns.Load(),
		DataReads: c.DataReads.Load(), DataReadBytes: c.DataReadBytes.Load(),
		DataWrites: c.DataWrites.Load(), DataWriteBytes: c.DataWriteBytes.Load(),
		MetaReads: c.MetaReads.Load(), MetaReadBytes: c.MetaReadBytes.Load(),
		MetaWrites: c.MetaWrites.Load(), MetaWriteBytes: c.MetaWriteBytes.Load(),
		Flushes: c.Flushes.Load(), Discards: c.Discards.Load(), Errors: c.Errors.Load(),
		Commits: c.Commits.Load(), JournalBytes: c.JournalBytes.Load(),
		Checkpoints: c.Checkpoints.Load(),
	}
}

func (c *Counters) metaRead(n int) {
	c.MetaReads.Add(1)
	c.MetaReadBytes.Add(uint64(n))
}

func (c *Counters) metaWrite(n int) {
	c.MetaWrites.Add(1)
	c.MetaWriteBytes.Add(uint64(n))
}

// Histogram counts observations into fixed buckets: bucket i counts values
// ≤ Bounds[i] (and above the bound before it); the last bucket counts the
// rest. Safe for concurrent use without locks. The zero value is unusable:
// the store initialises every Histogram with sizeBounds or latencyBounds.
type Histogram struct {
	bounds []float64
	counts []atomic.Uint64 // len(bounds)+1
	count  atomic.Uint64
	sum    atomic.Uint64 // math.Float64bits of the running sum
}

// sizeBounds: 512 B to 16 MiB, powers of two.
var sizeBounds = func() []float64 {
	var b []float64
	for s := 512.0; s <= 16<<20; s *= 2 {
		b = append(b, s)
	}
	return b
}()

// latencyBounds: 10 µs to 10 s, in seconds, about three per decade.
var latencyBounds = []float64{
	10e-6, 20e-6, 50e-6, 100e-6, 200e-6, 500e-6,
	1e-3, 2e-3, 5e-3, 10e-3, 20e-3, 50e-3, 100e-3, 200e-3, 500e-3, 1, 2, 5, 10,
}

// NewLatencyHistogram returns a histogram with the store's latency buckets
// (10 µs to 10 s, in seconds), for layers above the store to time their
// own operations alike.
func NewLatencyHistogram() *Histogram {
	h := &Histogram{}
	h.init(latencyBounds)
	return h
}

// Snapshot copies the histogram.
func (h *Histogram) Snapshot() HistogramSnapshot { return h.snapshot() }

func (h *Histogram) init(bounds []float64) {
	h.bounds = bounds
	h.counts = make([]atomic.Uint64, len(bounds)+1)
}

// Observe records one value.
func (h *Histogram) Observe(v float64) {
	i := 0
	for i < len(h.bounds) && v > h.bounds[i] {
		i++
	}
	h.counts[i].Add(1)
	h.count.Add(1)
	for {
		old := h.sum.Load()
		if h.sum.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

func (h *Histogram) observeSince(t time.Time) { h.Observe(time.Since(t).Seconds()) }

// HistogramSnapshot is a copy of a Histogram: Counts[i] observations fell
// at or below Bounds[i]; the last count is everything above the last bound.
type HistogramSnapshot struct {
	Bounds []float64 `json:"bounds"`
	Counts []uint64  `json:"counts"`
	Count  uint64    `json:"count"`
	Sum    float64   `json:"sum"`
}

// Mean is Sum/Count, or 0.
func (h HistogramSnapshot) Mean() float64 {
	if h.Count == 0 {
		return 0
	}
	return h.Sum / float64(h.Count)
}

// Quantile estimates the q-quantile (0..1) as the upper bound of the bucket
// it falls in.
func (h HistogramSnapshot) Quantile(q float64) float64 {
	if h.Count == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.Count)))
	var seen uint64
	for i, c := range h.Counts {
		seen += c
		if seen >= rank {
			if i < len(h.Bounds) {
				return h.Bounds[i]
			}
			return math.Inf(1)
		}
	}
	return math.Inf(1)
}

func (h *Histogram) snapshot() HistogramSnapshot {
	s := HistogramSnapshot{Bounds: h.bounds, Counts: make([]uint64, len(h.counts)), Count: h.count.Load(),
		Sum: math.Float64frombits(h.sum.Load())}
	for i := range h.counts {
		s.Counts[i] = h.counts[i].Load()
	}
	return s
}

func (c *Counters) init() {
	for _, h := range []*Histogram{&c.ReadRequestSize, &c.WriteRequestSize, &c.DataReadSize, &c.DataWriteSize} {
		h.init(sizeBounds)
	}
	for _, h := range []*Histogram{&c.DataReadLatency, &c.DataWriteLatency, &c.FlushLatency, &c.CommitLatency} {
		h.init(latencyBounds)
	}
}

// Metrics is everything the store counts, for `vdisk stats` and the
// Prometheus exporter.
type Metrics struct {
	Counters   CounterSnapshot              `json:"counters"`
	Histograms map[string]HistogramSnapshot `json:"histograms"`
	// Allocator and map state, in blocks.
	BlockSize        int           `json:"block_size"`
	DataBlocks       uint64        `json:"data_blocks"`
	FreeBlocks       uint64        `json:"free_blocks"`
	LargestFreeBlock uint64        `json:"largest_free_extent_blocks"`
	Extents          int           `json:"extents"`
	Disks            []DiskMetrics `json:"disks"`
}

// DiskMetrics are one disk's figures.
type DiskMetrics struct {
	Name              string `json:"name"`
	Size              int64  `json:"size"`
	Allocated         int64  `json:"allocated"`
	Extents           int    `json:"extents"`
	ReadRequests      uint64 `json:"read_requests"`
	ReadRequestBytes  uint64 `json:"read_request_bytes"`
	WriteRequests     uint64 `json:"write_requests"`
	WriteRequestBytes uint64 `json:"write_request_bytes"`
}

// diskCounters are a disk's own request counters.
type diskCounters struct {
	reads, readBytes, writes, writeBytes atomic.Uint64
}

// Metrics returns a snapshot of every counter and histogram, the
// allocator's state and each named disk's figures.
func (s *Store) Metrics() Metrics {
	c := &s.stats
	m := Metrics{
		Counters: c.snapshot(),
		Histograms: map[string]HistogramSnapshot{
			"read_request_size_bytes":        c.ReadRequestSize.snapshot(),
			"write_request_size_bytes":       c.WriteRequestSize.snapshot(),
			"data_read_size_bytes":           c.DataReadSize.snapshot(),
			"data_write_size_bytes":          c.DataWriteSize.snapshot(),
			"data_read_latency_seconds":      c.DataReadLatency.snapshot(),
			"data_write_latency_seconds":     c.DataWriteLatency.snapshot(),
			"flush_latency_seconds":          c.FlushLatency.snapshot(),
			"journal_commit_latency_seconds": c.CommitLatency.snapshot(),
		},
		BlockSize: int(s.bs),
	}
	info := s.Info()
	m.DataBlocks, m.FreeBlocks, m.LargestFreeBlock, m.Extents = info.DataBlocks, info.FreeBlocks, info.LargestFree, info.Extents
	s.mu.Lock()
	ds := make([]*disk, 0, len(s.mu.names))
	for _, d := range s.mu.names {
		ds = append(ds, d)
	}
	s.mu.Unlock()
	for _, d := range ds {
		i := d.info()
		m.Disks = append(m.Disks, DiskMetrics{Name: i.Name, Size: i.Size, Allocated: i.Allocated, Extents: i.Extents,
			ReadRequests: d.counters.reads.Load(), ReadRequestBytes: d.counters.readBytes.Load(),
			WriteRequests: d.counters.writes.Load(), WriteRequestBytes: d.counters.writeBytes.Load()})
	}
	sortDiskMetrics(m.Disks)
	return m
}
