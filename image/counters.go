package image

import (
	"math"
	"sync/atomic"
	"time"
)

// Counters count what every layer of the store passes down, so that the
// size of I/O can be seen at each step (the seed's diagnosis, that every
// large request went down as 4 KiB I/Os, stayed invisible because no layer
// counted).
// All fields are safe for concurrent use; read them through Store.Metrics or
// Store.Counters.
//
// What every request counts lives in counterShards copies (Shard). A request
// counts into the shard of its scratch, and sync.Pool keeps scratches per P,
// so two CPUs serving requests at once write different cache lines: with one
// shared copy, every 4 KiB request pulled about a dozen lines from the other
// CPU, and the engine's own cost per request doubled on two CPUs
// (BenchmarkEngineRead4KiBParallel). Snapshots sum the shards. The rest is
// rare (metadata, flushes, commits) and has one copy.
type Counters struct {
	shards [counterShards]Shard

	// Allocations of new data blocks (counted under the store's lock).
	Allocations     atomic.Uint64 // allocator calls for data
	AllocatedBlocks atomic.Uint64

	// Backend metadata I/O: superblocks, journal, checkpoints.
	MetaReads, MetaReadBytes   atomic.Uint64
	MetaWrites, MetaWriteBytes atomic.Uint64
	Flushes                    atomic.Uint64
	FlushLatency               Histogram // nanoseconds
	Discards                   atomic.Uint64
	Errors                     atomic.Uint64 // backend errors of any kind
	// PreparedBytes: zeros written over free blocks of a store file ahead
	// of their first use (Store.prepareChunk), not counted as data writes.
	PreparedBytes atomic.Uint64
	// UnlockFailures: keys refused by Store.Unlock (ErrWrongKey).
	UnlockFailures atomic.Uint64

	// Declines: plans a door's queue thread asked for and did not get,
	// by reason (Decline); those requests went the way that may block.
	Declines declineCounts

	// Journal.
	Commits          atomic.Uint64 // journal commits written
	UnflushedCommits atomic.Uint64 // of Commits, the timer's of times alone, not flushed (Store.commitBackground)
	JournalBytes     atomic.Uint64
	CommitLatency    Histogram // nanoseconds, whole commit: flush, write, flush
	Checkpoints      atomic.Uint64
}

// counterShards is the number of Shards: more than the CPUs of the machines
// the store runs on, so that Ps seldom share one.
const counterShards = 16

// Shard is one copy of the counters every request touches. Request and
// backend I/O counts and bytes are the count and sum of the size histograms.
type Shard struct {
	// Requests: calls of the Disk API (for a mount, one per FUSE read or
	// write), by size in bytes.
	ReadRequestSize, WriteRequestSize Histogram

	// Map: lookups of a request's block range and the segments (data or
	// hole pieces) they returned.
	Lookups, LookupSegments atomic.Uint64

	// Coalescer: data pieces in, backend runs out (runs ≤ pieces: one run
	// per physically contiguous stretch).
	CoalescePieces, CoalesceRuns atomic.Uint64

	// Backend data I/O, by size in bytes and by latency in nanoseconds:
	// each I/O once. An I/O run by ReadAt or WriteAt is timed on its own;
	// the I/Os of a plan a door issues together on its ring are timed
	// from the plan's submission to its completion (IOPlan.Finish).
	DataReadSize, DataWriteSize       Histogram
	DataReadLatency, DataWriteLatency Histogram
	// DurableWrites are the data writes made durable on their own (FUA),
	// for synchronous overwrites in place; DataWriteSize counts them too.
	DurableWrites atomic.Uint64
	// EncryptedBytes and DecryptedBytes: data of encrypted disks
	// encrypted for a write and decrypted after a read, in whole blocks.
	EncryptedBytes, DecryptedBytes atomic.Uint64

	_ [cacheLine]byte // the next shard starts on another cache line
}

// cacheLine is the size of a CPU cache line (64 bytes on x86-64 and arm64;
// 128 covers the adjacent-line prefetcher too).
const cacheLine = 128

// shard returns the shard a request with scratch sc counts into.
func (c *Counters) shard(sc *scratch) *Shard { return &c.shards[sc.shard%counterShards] }

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
	DurableWrites     uint64 `json:"durable_writes"`
	EncryptedBytes    uint64 `json:"encrypted_bytes"`
	DecryptedBytes    uint64 `json:"decrypted_bytes"`
	MetaReads         uint64 `json:"meta_reads"`
	MetaReadBytes     uint64 `json:"meta_read_bytes"`
	MetaWrites        uint64 `json:"meta_writes"`
	MetaWriteBytes    uint64 `json:"meta_write_bytes"`
	Flushes           uint64 `json:"flushes"`
	Discards          uint64 `json:"discards"`
	PreparedBytes     uint64 `json:"prepared_bytes"`
	UnlockFailures    uint64 `json:"unlock_failures"`
	Errors            uint64 `json:"errors"`
	Commits           uint64 `json:"commits"`
	UnflushedCommits  uint64 `json:"unflushed_commits"`
	JournalBytes      uint64 `json:"journal_bytes"`
	Checkpoints       uint64 `json:"checkpoints"`
	// PlanDeclines counts the declined plans by reason (Decline.String),
	// the reasons never seen left out.
	PlanDeclines map[string]uint64 `json:"plan_declines,omitempty"`
}

func (c *Counters) snapshot() CounterSnapshot {
	out := CounterSnapshot{
		MetaReads: c.MetaReads.Load(), MetaReadBytes: c.MetaReadBytes.Load(),
		MetaWrites: c.MetaWrites.Load(), MetaWriteBytes: c.MetaWriteBytes.Load(),
		Flushes: c.Flushes.Load(), Discards: c.Discards.Load(), Errors: c.Errors.Load(),
		PreparedBytes: c.PreparedBytes.Load(), UnlockFailures: c.UnlockFailures.Load(),
		Commits: c.Commits.Load(), JournalBytes: c.JournalBytes.Load(),
		UnflushedCommits: c.UnflushedCommits.Load(),
		Checkpoints:      c.Checkpoints.Load(),
		Allocations:      c.Allocations.Load(), AllocatedBlocks: c.AllocatedBlocks.Load(),
		PlanDeclines: c.Declines.snapshot(),
	}
	for i := range c.shards {
		sh := &c.shards[i]
		sh.ReadRequestSize.addTo(&out.ReadRequests, &out.ReadRequestBytes)
		sh.WriteRequestSize.addTo(&out.WriteRequests, &out.WriteRequestBytes)
		out.Lookups += sh.Lookups.Load()
		out.LookupSegments += sh.LookupSegments.Load()
		out.CoalescePieces += sh.CoalescePieces.Load()
		out.CoalesceRuns += sh.CoalesceRuns.Load()
		sh.DataReadSize.addTo(&out.DataReads, &out.DataReadBytes)
		sh.DataWriteSize.addTo(&out.DataWrites, &out.DataWriteBytes)
		out.DurableWrites += sh.DurableWrites.Load()
		out.EncryptedBytes += sh.EncryptedBytes.Load()
		out.DecryptedBytes += sh.DecryptedBytes.Load()
	}
	return out
}

// histograms snapshots the histograms, the shards' summed.
func (c *Counters) histograms() map[string]HistogramSnapshot {
	merged := func(get func(*Shard) *Histogram) HistogramSnapshot {
		out := get(&c.shards[0]).snapshot()
		for i := 1; i < len(c.shards); i++ {
			out.add(get(&c.shards[i]).snapshot())
		}
		return out
	}
	return map[string]HistogramSnapshot{
		"read_request_size_bytes":        merged(func(s *Shard) *Histogram { return &s.ReadRequestSize }),
		"write_request_size_bytes":       merged(func(s *Shard) *Histogram { return &s.WriteRequestSize }),
		"data_read_size_bytes":           merged(func(s *Shard) *Histogram { return &s.DataReadSize }),
		"data_write_size_bytes":          merged(func(s *Shard) *Histogram { return &s.DataWriteSize }),
		"data_read_latency_seconds":      merged(func(s *Shard) *Histogram { return &s.DataReadLatency }),
		"data_write_latency_seconds":     merged(func(s *Shard) *Histogram { return &s.DataWriteLatency }),
		"flush_latency_seconds":          c.FlushLatency.snapshot(),
		"journal_commit_latency_seconds": c.CommitLatency.snapshot(),
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
// ≤ bounds[i] (and above the bound before it); the last bucket counts the
// rest. Values are whole numbers in the histogram's unit (bytes, or
// nanoseconds for latencies); snapshots convert them with scale (to seconds).
// Safe for concurrent use without locks: an observation is two atomic adds.
// The zero value is unusable: the store initialises every Histogram with
// sizeBounds or latencyBounds.
type Histogram struct {
	bounds []uint64
	scale  float64 // snapshot unit per value unit
	counts [maxBuckets]atomic.Uint64
	sum    atomic.Uint64
}

// maxBuckets bounds len(bounds)+1, so that the buckets are part of the
// Histogram (and of its Shard's cache lines), not a separate allocation.
const maxBuckets = 24

// sizeBounds: 512 B to 16 MiB, powers of two.
var sizeBounds = func() []uint64 {
	var b []uint64
	for s := uint64(512); s <= 16<<20; s *= 2 {
		b = append(b, s)
	}
	return b
}()

// latencyBounds: 10 µs to 10 s, in nanoseconds, about three per decade.
var latencyBounds = func() []uint64 {
	secs := []float64{10e-6, 20e-6, 50e-6, 100e-6, 200e-6, 500e-6,
		1e-3, 2e-3, 5e-3, 10e-3, 20e-3, 50e-3, 100e-3, 200e-3, 500e-3, 1, 2, 5, 10}
	b := make([]uint64, len(secs))
	for i, s := range secs {
		b[i] = uint64(math.Round(s * 1e9))
	}
	return b
}()

// NewLatencyHistogram returns a histogram with the store's latency buckets
// (10 µs to 10 s; snapshots in seconds), for layers above the store to time
// their own operations alike with ObserveDuration.
func NewLatencyHistogram() *Histogram {
	h := &Histogram{}
	h.initLatency()
	return h
}

// Snapshot copies the histogram.
func (h *Histogram) Snapshot() HistogramSnapshot { return h.snapshot() }

func (h *Histogram) initSize() { h.bounds, h.scale = sizeBounds, 1 }

func (h *Histogram) initLatency() { h.bounds, h.scale = latencyBounds, 1e-9 }

// Observe records one value, in the histogram's unit.
func (h *Histogram) Observe(v uint64) {
	i := 0
	for i < len(h.bounds) && v > h.bounds[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sum.Add(v)
}

// ObserveDuration records a latency (a histogram from NewLatencyHistogram).
func (h *Histogram) ObserveDuration(d time.Duration) { h.Observe(uint64(max(d, 0))) }

func (h *Histogram) observeSince(t time.Time) { h.ObserveDuration(time.Since(t)) }

// count is the number of observations: the sum of the buckets.
func (h *Histogram) count() uint64 {
	var n uint64
	for i := range len(h.bounds) + 1 {
		n += h.counts[i].Load()
	}
	return n
}

// addTo adds h's count of observations to *count and their sum to *sum
// (a size histogram's: bytes).
func (h *Histogram) addTo(count, sum *uint64) {
	*count += h.count()
	*sum += h.sum.Load()
}

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
	s := HistogramSnapshot{Bounds: make([]float64, len(h.bounds)), Counts: make([]uint64, len(h.bounds)+1),
		Sum: float64(h.sum.Load()) * h.scale}
	for i, b := range h.bounds {
		s.Bounds[i] = float64(b) * h.scale
	}
	for i := range s.Counts {
		s.Counts[i] = h.counts[i].Load()
		s.Count += s.Counts[i]
	}
	return s
}

// add adds o, a snapshot of a histogram with the same bounds, to s.
func (s *HistogramSnapshot) add(o HistogramSnapshot) {
	for i := range s.Counts {
		s.Counts[i] += o.Counts[i]
	}
	s.Count += o.Count
	s.Sum += o.Sum
}

func (c *Counters) init() {
	for i := range c.shards {
		sh := &c.shards[i]
		for _, h := range []*Histogram{&sh.ReadRequestSize, &sh.WriteRequestSize, &sh.DataReadSize, &sh.DataWriteSize} {
			h.initSize()
		}
		sh.DataReadLatency.initLatency()
		sh.DataWriteLatency.initLatency()
	}
	c.FlushLatency.initLatency()
	c.CommitLatency.initLatency()
}

// Metrics is everything the store counts, for `vdisk stats` and the
// Prometheus exporter.
type Metrics struct {
	Counters   CounterSnapshot              `json:"counters"`
	Histograms map[string]HistogramSnapshot `json:"histograms"`
	// Allocator and map state, in blocks.
	BlockSize        int    `json:"block_size"`
	DataBlocks       uint64 `json:"data_blocks"`
	FreeBlocks       uint64 `json:"free_blocks"`
	LargestFreeBlock uint64 `json:"largest_free_extent_blocks"`
	// ReservedBlocks of FreeBlocks are held by allocation units.
	ReservedBlocks uint64        `json:"reserved_blocks"`
	Extents        int           `json:"extents"`
	Disks          []DiskMetrics `json:"disks"`
	// Failed: a flush or metadata write failed and the store refuses
	// every write and sync until it is reopened (ErrFailed).
	Failed bool `json:"failed"`
	// LockedDisks are the encrypted disks whose key was not given.
	LockedDisks int `json:"locked_disks"`
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

// diskCounters are a disk's own request counters, sharded like the
// store's (see Counters).
type diskCounters struct {
	shards [counterShards]diskShard
}

type diskShard struct {
	reads, readBytes, writes, writeBytes atomic.Uint64
	_                                    [cacheLine - 32]byte
}

// shard returns the shard a request with scratch sc counts into.
func (c *diskCounters) shard(sc *scratch) *diskShard { return &c.shards[sc.shard%counterShards] }

// totals sums the shards.
func (c *diskCounters) totals() (reads, readBytes, writes, writeBytes uint64) {
	for i := range c.shards {
		sh := &c.shards[i]
		reads += sh.reads.Load()
		readBytes += sh.readBytes.Load()
		writes += sh.writes.Load()
		writeBytes += sh.writeBytes.Load()
	}
	return reads, readBytes, writes, writeBytes
}

// Metrics returns a snapshot of every counter and histogram, the
// allocator's state and each named disk's figures.
func (s *Store) Metrics() Metrics {
	c := &s.stats
	m := Metrics{
		Counters:   c.snapshot(),
		Histograms: c.histograms(),
		BlockSize:  int(s.bs),
	}
	info := s.Info()
	m.DataBlocks, m.FreeBlocks, m.LargestFreeBlock, m.Extents = info.DataBlocks, info.FreeBlocks, info.LargestFree, info.Extents
	m.ReservedBlocks = info.ReservedBlocks
	s.mu.Lock()
	m.Failed = s.mu.failed != nil
	ds := make([]*disk, 0, len(s.mu.names))
	for _, d := range s.mu.names {
		ds = append(ds, d)
	}
	s.mu.Unlock()
	for _, d := range ds {
		i := d.info()
		dm := DiskMetrics{Name: i.Name, Size: i.Size, Allocated: i.Allocated, Extents: i.Extents}
		dm.ReadRequests, dm.ReadRequestBytes, dm.WriteRequests, dm.WriteRequestBytes = d.counters.totals()
		m.Disks = append(m.Disks, dm)
		if i.Locked {
			m.LockedDisks++
		}
	}
	sortDiskMetrics(m.Disks)
	return m
}
